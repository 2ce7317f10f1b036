//! An error's full text for the user: its message, then each cause in its
//! `source()` chain after ": ", the way anyhow's `{:#}` prints one, so the
//! library crates' typed errors read as they did through anyhow. A cause
//! whose text its effect already ends with (`"{path}: {source}"` messages,
//! which also return that source) is not printed a second time.

/// `e` followed by each of its causes, `": "`-separated, a cause the text
/// already ends with left out.
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.ends_with(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
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

    #[derive(Debug, thiserror::Error)]
    enum Said {
        #[error("{path}: {source}")]
        Io { path: String, source: io::Error },
        #[error("merging lease 3: {source}")]
        Merge { source: Outer },
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

    /// A cause its effect's message already ends with is printed once, and
    /// the causes below it still are.
    #[test]
    fn a_cause_the_message_already_says_is_printed_once() {
        let missing = || io::Error::new(io::ErrorKind::NotFound, "no such file");
        let io = Said::Io {
            path: "m.gguf".into(),
            source: missing(),
        };
        assert_eq!(with_causes(&io), "m.gguf: no such file");
        let merge = Said::Merge {
            source: Outer::Create {
                path: "out/m.gguf".into(),
                source: missing(),
            },
        };
        assert_eq!(
            with_causes(&merge),
            "merging lease 3: creating out/m.gguf: no such file"
        );
    }
}
