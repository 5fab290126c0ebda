//! The state directory of one network, `dataDir/<network>/`: a lock file (flock), the state file (replaced
//! atomically) and the journal (appended). What goes in the files is [`crate::state`]'s business.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use crate::Error;

/// The state file's name.
pub const STATE_FILE: &str = "state";
/// The journal's name.
pub const JOURNAL_FILE: &str = "journal";
const LOCK_FILE: &str = "lock";

/// An open state directory, locked for as long as the value lives.
pub struct Store {
    dir: PathBuf,
    /// Wait for each change to reach the disk (fdatasync, directory fsync). Without it, a crash of the
    /// plugin still leaves a consistent state (atomic rename, torn-last-line handling); a power loss may lose
    /// the latest changes, like `host-local`.
    sync: bool,
    // Closing the file releases the flock.
    _lock: File,
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_owned();
    move |source| Error::Io { what, path, source }
}

impl Store {
    /// Opens (creating it when missing) `data_dir/network` and takes its lock: exclusive for commands that
    /// write, shared for those that only read. Processes wait for each other here. `sync`: fdatasync every
    /// write before returning.
    pub fn open(
        data_dir: &Path,
        network: &str,
        exclusive: bool,
        sync: bool,
    ) -> Result<Store, Error> {
        let dir = data_dir.join(network);
        if let Err(e) = fs::create_dir(&dir) {
            if e.kind() != ErrorKind::AlreadyExists {
                fs::create_dir_all(&dir).map_err(io_err("create state directory", &dir))?;
            }
        }
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err("open lock file", &lock_path))?;
        if exclusive {
            lock.lock()
        } else {
            lock.lock_shared()
        }
        .map_err(io_err("lock", &lock_path))?;
        Ok(Store {
            dir,
            sync,
            _lock: lock,
        })
    }

    /// The state file's path.
    pub fn state_path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, Error> {
        let path = self.dir.join(name);
        let mut f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(Error::Io {
                    what: "open",
                    path,
                    source,
                })
            }
        };
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).map_err(io_err("read", &path))?;
        Ok(Some(buf))
    }

    /// The state file's bytes, `None` before the first write.
    pub fn read_state(&self) -> Result<Option<Vec<u8>>, Error> {
        self.read(STATE_FILE)
    }

    /// The journal's bytes (empty when there is none).
    pub fn read_journal(&self) -> Result<Vec<u8>, Error> {
        Ok(self.read(JOURNAL_FILE)?.unwrap_or_default())
    }

    /// Cuts the journal to `len` bytes (drops an interrupted append).
    pub fn truncate_journal(&self, len: usize) -> Result<(), Error> {
        let path = self.dir.join(JOURNAL_FILE);
        let f = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io_err("open", &path))?;
        f.set_len(len as u64).map_err(io_err("truncate", &path))?;
        self.sync_file(&f, &path)
    }

    fn sync_file(&self, f: &File, path: &Path) -> Result<(), Error> {
        if self.sync {
            f.sync_data().map_err(io_err("sync", path))?;
        }
        Ok(())
    }

    /// Appends to the journal (one write: a crash leaves it whole or torn, never interleaved) and, when
    /// syncing, waits until it is on disk.
    pub fn append_journal(&self, bytes: &[u8]) -> Result<(), Error> {
        let path = self.dir.join(JOURNAL_FILE);
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .map_err(io_err("open", &path))?;
        f.write_all(bytes).map_err(io_err("append to", &path))?;
        self.sync_file(&f, &path)
    }

    /// Replaces the state file, then starts a new journal with `journal_header`.
    ///
    /// The state is written to a temporary file, renamed over the old one (with `sync`: the file fsync'ed
    /// before, the directory after): a crash leaves the old or the new state, never a mix. The journal's header names the
    /// state's generation, so a crash before the journal is reset leaves a journal that no longer applies.
    pub fn write_state(&self, bytes: &[u8], journal_header: &[u8]) -> Result<(), Error> {
        let tmp = self.dir.join(".state.tmp");
        let mut f = File::create(&tmp).map_err(io_err("create", &tmp))?;
        f.write_all(bytes).map_err(io_err("write", &tmp))?;
        self.sync_file(&f, &tmp)?;
        drop(f);
        let path = self.state_path();
        fs::rename(&tmp, &path).map_err(io_err("rename state to", &path))?;
        if self.sync {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err("sync directory", &self.dir))?;
        }
        let jpath = self.dir.join(JOURNAL_FILE);
        let mut j = File::create(&jpath).map_err(io_err("create", &jpath))?;
        j.write_all(journal_header)
            .map_err(io_err("write", &jpath))?;
        self.sync_file(&j, &jpath)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_append_read() {
        for sync in [false, true] {
            let d = tempfile::tempdir().unwrap();
            let s = Store::open(d.path(), "net", true, sync).unwrap();
            assert_eq!(s.read_state().unwrap(), None);
            assert!(s.read_journal().unwrap().is_empty());
            s.write_state(b"one", b"gen 1\n").unwrap();
            s.append_journal(b"+ a\n").unwrap();
            s.append_journal(b"+ b").unwrap();
            s.truncate_journal(10).unwrap();
            assert_eq!(s.read_journal().unwrap(), b"gen 1\n+ a\n");
            s.write_state(b"two", b"gen 2\n").unwrap();
            assert_eq!(s.read_state().unwrap().as_deref(), Some(&b"two"[..]));
            assert_eq!(s.read_journal().unwrap(), b"gen 2\n");
            let mut names: Vec<_> = fs::read_dir(d.path().join("net"))
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            assert_eq!(
                names,
                ["journal", "lock", "state"],
                "no temporary file left"
            );
        }
    }

    #[test]
    fn exclusive_lock_excludes() {
        let d = tempfile::tempdir().unwrap();
        let held = Store::open(d.path(), "net", true, false).unwrap();
        let other = File::open(d.path().join("net").join(LOCK_FILE)).unwrap();
        assert!(matches!(
            other.try_lock_shared(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        drop(held);
        assert!(other.try_lock().is_ok());
    }
}
