//! `kube-ovn-controller`: see the library's docs and `--help`.

use std::process::ExitCode;

use kube_ovn_controller::{Args, Command};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (the sys crate names only older options).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Returns freed memory to the OS at once. mimalloc's default (1 s, and only when the freeing thread
/// allocates again) left the buffers of bursts (watch events, the initial northbound sync) resident in
/// idle workers: measured at 50,000 pods, RSS 156 -> 127 MiB, and 282 -> 116 MiB after a restart.
#[allow(unsafe_code)]
fn purge_freed_memory_at_once() {
    // SAFETY: sets a process-wide option before any other thread exists (mi_option_set is not thread
    // safe); the index is checked against mimalloc's default by the test below.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
}

fn main() -> ExitCode {
    purge_freed_memory_at_once();
    let args = match Args::parse(std::env::args_os().skip(1)) {
        Ok(a) => a,
        // Usage errors on stderr with status 2; --help and --version on stdout with status 0.
        Err(e) => e.exit(),
    };
    if args.command == Command::Crd {
        print!("{}", kubeovn_core::crd::crds_yaml());
        return ExitCode::SUCCESS;
    }
    args.log.init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kube-ovn-controller: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(kube_ovn_controller::run(
        args,
        kube_ovn_cmd::shutdown_signal(),
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The last line of the log, as the operator reads it (a test checks its wording).
            eprintln!("kube-ovn-controller: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[allow(unsafe_code)]
    fn purge_delay_is_the_option_it_names() {
        // SAFETY: reads an option.
        let default = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        // mimalloc 3's default purge delay (options.c); another option at this index would differ.
        assert_eq!(default, 1000);
        super::purge_freed_memory_at_once();
        // SAFETY: reads an option.
        assert_eq!(
            unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) },
            0
        );
    }
}
