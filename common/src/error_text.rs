//! An error's full text for the user: its message, then each cause in its
//! `source()` chain after ": ", the way anyhow's `{:#}` prints one, so the
//! library crates' typed errors read as they did through anyhow.

/// `e` followed by each of its causes, `": "`-separated.
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::with_causes;
    use std::io;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("creating {path}")]
        Create {
            path: String,
            #[source]
            source: io::Error,
        },
        #[error("--chunks: {reason}")]
        Arg { reason: String },
    }

    /// Each cause follows its effect after ": ", as anyhow's `{:#}` does.
    #[test]
    fn errors_print_with_their_causes_as_anyhow_did() {
        let errors = || {
            [
                Outer::Create {
                    path: "out/m.gguf".into(),
                    source: io::Error::other("no space"),
                },
                Outer::Arg {
                    reason: "bad range".into(),
                },
            ]
        };
        for (e, a) in errors().into_iter().zip(errors()) {
            assert_eq!(with_causes(&e), format!("{:#}", anyhow::Error::from(a)));
        }
        let [create, _] = errors();
        assert_eq!(with_causes(&create), "creating out/m.gguf: no space");
    }
}
