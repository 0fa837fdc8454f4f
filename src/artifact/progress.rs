//! A download progress bar on stderr, drawn only when stderr is a terminal (never into
//! journald or a log file).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress bar for a download of `len` bytes (unknown: a spinner), or a hidden one when
/// `wanted` is false or stderr is not a terminal.
pub(crate) fn bar(wanted: bool, len: Option<u64>, location: &str) -> ProgressBar {
    if !wanted || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = match len {
        Some(n) => ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr()),
        None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
    };
    let template = if len.is_some() {
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}"
    } else {
        "{msg} {spinner} {bytes} {bytes_per_sec}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    let name = location.rsplit('/').next().unwrap_or(location);
    bar.set_message(name.to_string());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_bar_is_drawn_unless_wanted_and_on_a_terminal() {
        assert!(bar(false, Some(10), "http://h/x.tgz").is_hidden());
        if !std::io::stderr().is_terminal() {
            assert!(bar(true, Some(10), "http://h/x.tgz").is_hidden());
        }
    }
}
