//! Why a configuration was rejected.

/// Why a configuration was rejected. Every variant names where the problem is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// Not YAML/JSON, or the document does not have the expected shape (unknown key, wrong type).
    Syntax(String),
    /// A value is present and well-typed but not acceptable.
    Invalid { key: String, reason: String },
}

impl ConfigError {
    pub(super) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Syntax(message) => write!(f, "invalid configuration: {message}"),
            ConfigError::Invalid { key, reason } => {
                write!(f, "invalid configuration at '{key}': {reason}")
            }
        }
    }
}
