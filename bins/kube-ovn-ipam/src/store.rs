//! The state directory of one network: a lock file (flock) and a state file replaced atomically.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use crate::Error;

/// The state file's name inside `dataDir/<network>/`.
pub const STATE_FILE: &str = "state.json";
const LOCK_FILE: &str = "lock";

/// An open state directory, locked for as long as the value lives.
pub struct Store {
    dir: PathBuf,
    // Closing the file releases the flock.
    _lock: File,
}

impl Store {
    /// Opens (creating it when missing) `data_dir/network`, and takes its lock: exclusive for commands that
    /// write, shared for those that only read.
    pub fn open(data_dir: &Path, network: &str, exclusive: bool) -> Result<Store, Error> {
        let dir = data_dir.join(network);
        let io = |what: &'static str, path: &Path| {
            let path = path.to_owned();
            move |source| Error::Io { what, path, source }
        };
        fs::create_dir_all(&dir).map_err(io("create state directory", &dir))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io("open lock file", &lock_path))?;
        if exclusive { lock.lock() } else { lock.lock_shared() }.map_err(io("lock", &lock_path))?;
        Ok(Store { dir, _lock: lock })
    }

    /// The state file's path.
    pub fn state_path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// The state file's bytes, `None` before the first write.
    pub fn read(&self) -> Result<Option<Vec<u8>>, Error> {
        let path = self.state_path();
        let mut f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(Error::Io { what: "open state", path, source }),
        };
        let mut buf = Vec::with_capacity(64 * 1024);
        f.read_to_end(&mut buf).map_err(|source| Error::Io { what: "read state", path, source })?;
        Ok(Some(buf))
    }

    /// Replaces the state file: write a temporary file, fsync it, rename it over the old one, fsync the
    /// directory. A crash leaves either the old or the new state, never a mix.
    pub fn write(&self, bytes: &[u8]) -> Result<(), Error> {
        let tmp = self.dir.join(".state.json.tmp");
        let io = |what: &'static str, path: &Path| {
            let path = path.to_owned();
            move |source| Error::Io { what, path, source }
        };
        let mut f = File::create(&tmp).map_err(io("create temporary state", &tmp))?;
        f.write_all(bytes).map_err(io("write temporary state", &tmp))?;
        f.sync_data().map_err(io("sync temporary state", &tmp))?;
        drop(f);
        let path = self.state_path();
        fs::rename(&tmp, &path).map_err(io("rename state", &path))?;
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io("sync state directory", &self.dir))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_replace() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path(), "net", true).unwrap();
        assert_eq!(s.read().unwrap(), None);
        s.write(b"one").unwrap();
        s.write(b"two").unwrap();
        assert_eq!(s.read().unwrap().as_deref(), Some(&b"two"[..]));
        let names: Vec<_> = fs::read_dir(d.path().join("net")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "lock and state, no temporary left: {names:?}");
    }

    #[test]
    fn exclusive_lock_excludes() {
        let d = tempfile::tempdir().unwrap();
        let _held = Store::open(d.path(), "net", true).unwrap();
        let other = File::open(d.path().join("net").join(LOCK_FILE)).unwrap();
        assert!(matches!(other.try_lock(), Err(std::fs::TryLockError::WouldBlock)));
    }
}
