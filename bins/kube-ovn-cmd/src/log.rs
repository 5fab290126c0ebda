//! Log set-up for the binaries: `tracing` events on stderr, as text or JSON lines.
//!
//! - `--log-level LEVEL` (`error`, `warn`, `info`, `debug`, `trace`; default `info`): the level of
//!   kubeovn-rs' own modules (`kubeovn_*`, `kube_ovn_*`); other crates (kube, hyper, rustls...) log from
//!   `warn` up.
//! - `RUST_LOG`, when set, replaces that filter with `tracing-subscriber`'s directives, per module:
//!   `RUST_LOG=info,kubeovn_ovn::session=debug,kube_runtime=info`.
//! - `--log-format text` (default): `TIME LEVEL target: message key=value ...`; `--log-format json`: one
//!   JSON object per line (`timestamp`, `level`, `target`, `fields`), for a log collector.
//!
//! ```
//! use kube_ovn_cmd::log::{filter_directives, LogFormat};
//! assert_eq!(
//!     filter_directives(tracing::Level::DEBUG),
//!     "warn,kubeovn=debug,kube_ovn=debug"
//! );
//! assert_eq!(LogFormat::default(), LogFormat::Text);
//! ```

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The log flags every long-running binary takes (`#[command(flatten)]` into its clap parser).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct LogArgs {
    /// Level of kubeovn-rs' own modules (other crates log from warn up); RUST_LOG, when set, replaces
    /// this filter with per-module directives (e.g. RUST_LOG=info,kubeovn_ovn::session=debug)
    #[arg(
        long = "log-level",
        value_name = "LEVEL",
        default_value = "info",
        value_parser = ["error", "warn", "info", "debug", "trace"],
    )]
    pub level: String,
    /// Log line format on stderr
    #[arg(
        long = "log-format",
        value_enum,
        value_name = "FORMAT",
        default_value_t
    )]
    pub format: LogFormat,
}

impl Default for LogArgs {
    fn default() -> LogArgs {
        LogArgs {
            level: "info".to_owned(),
            format: LogFormat::Text,
        }
    }
}

impl LogArgs {
    /// The level of `--log-level` (INFO for anything unknown; clap accepts only the five names).
    pub fn level(&self) -> tracing::Level {
        self.level.parse().unwrap_or(tracing::Level::INFO)
    }

    /// Installs the global subscriber ([`init`]).
    pub fn init(&self) {
        init(self.level(), self.format);
    }
}

/// The format of the log lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `TIME LEVEL target: message key=value ...`.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The filter without `RUST_LOG`: our modules at `level`, everything else from `warn` up.
pub fn filter_directives(level: tracing::Level) -> String {
    let l = level.as_str().to_ascii_lowercase();
    format!("warn,kubeovn={l},kube_ovn={l}")
}

/// The filter: `RUST_LOG` when set and not empty, else [`filter_directives`]; a `RUST_LOG` that does not
/// parse falls back to the latter, and says so.
fn filter(level: tracing::Level) -> (EnvFilter, Option<String>) {
    let default = || EnvFilter::new(filter_directives(level));
    match std::env::var(EnvFilter::DEFAULT_ENV) {
        Ok(v) if !v.trim().is_empty() => match EnvFilter::try_new(&v) {
            Ok(f) => (f, None),
            Err(e) => (default(), Some(format!("RUST_LOG={v:?} ignored: {e}"))),
        },
        _ => (default(), None),
    }
}

/// Installs the global `tracing` subscriber: events on stderr in `format`, filtered by `RUST_LOG` or
/// `level` (see the module docs). Colours only when stderr is a terminal. A second call does nothing.
pub fn init(level: tracing::Level, format: LogFormat) {
    let (filter, warning) = filter(level);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
    };
    if let (Ok(()), Some(w)) = (installed, warning) {
        tracing::warn!("{w}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        log: LogArgs,
    }

    #[test]
    fn flags() {
        let c = Cli::try_parse_from(["x"]).expect("defaults");
        assert_eq!(c.log, LogArgs::default());
        assert_eq!(c.log.level(), tracing::Level::INFO);
        let c =
            Cli::try_parse_from(["x", "--log-level=debug", "--log-format", "json"]).expect("flags");
        assert_eq!(c.log.level(), tracing::Level::DEBUG);
        assert_eq!(c.log.format, LogFormat::Json);
        let e = Cli::try_parse_from(["x", "--log-level", "loud"]).expect_err("bad level");
        assert!(e.to_string().contains("--log-level"), "{e}");
        let e = Cli::try_parse_from(["x", "--log-format=xml"]).expect_err("bad format");
        assert!(e.to_string().contains("--log-format"), "{e}");
    }

    #[test]
    fn directives_parse() {
        for l in [tracing::Level::ERROR, tracing::Level::TRACE] {
            EnvFilter::try_new(filter_directives(l)).expect("valid directives");
        }
    }
}
