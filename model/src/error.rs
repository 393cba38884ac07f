//! [`ModelError`]: why a model could not be imported, cut into tasks or run.

/// Why a model could not be imported, cut into tasks or run. Every variant that concerns one
/// node names it and its op type, so that a user can find it in the model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The model file could not be read.
    #[error("cannot read `{path}`: {reason}")]
    Io {
        /// The file.
        path: String,
        /// What the system said.
        reason: String,
    },
    /// The bytes are not an ONNX model (protobuf decoding failed).
    #[error("not an ONNX model: {0}")]
    Decode(String),
    /// The model is an ONNX message but breaks a rule of the format (a value used before it
    /// is defined, a tensor whose data does not match its shape, ...).
    #[error("malformed model: {0}")]
    Malformed(String),
    /// A node the importer cannot run: its op type, or an attribute, input or dtype of it.
    #[error("node `{node}` ({op}): unsupported: {reason}")]
    Unsupported {
        /// The node's name (or its first output where it has none).
        node: String,
        /// Its op type.
        op: String,
        /// What is not supported.
        reason: String,
    },
    /// A node whose inputs do not fit its op (shapes that do not broadcast, an axis out of
    /// range, ...).
    #[error("node `{node}` ({op}): {reason}")]
    Invalid {
        /// The node.
        node: String,
        /// Its op type.
        op: String,
        /// What is wrong.
        reason: String,
    },
    /// A graph input whose shape is not known: a dynamic dimension no `--input-shape` fixed,
    /// or an override that does not fit the input.
    #[error("input `{input}`: {reason}")]
    InputShape {
        /// The graph input.
        input: String,
        /// What is missing or wrong.
        reason: String,
    },
    /// A tensor whose data lives in a file beside the model (ONNX external data), which the
    /// importer does not read.
    #[error("tensor `{0}` keeps its data in an external file, which is not supported")]
    ExternalData(String),
    /// The arrays given to a run do not match the model's inputs.
    #[error("{0}")]
    RunInputs(String),
    /// A task's tensor expression failed to build (a bug if it ever happens).
    #[error("node `{node}`: building its tensor expression: {reason}")]
    Dag {
        /// The node.
        node: String,
        /// The DAG error.
        reason: String,
    },
}

impl ModelError {
    /// An [`ModelError::Unsupported`] for `node`.
    pub fn unsupported(node: &crate::graph::Node, reason: impl Into<String>) -> ModelError {
        ModelError::Unsupported {
            node: node.name.clone(),
            op: node.op.clone(),
            reason: reason.into(),
        }
    }

    /// An [`ModelError::Invalid`] for `node`.
    pub fn invalid(node: &crate::graph::Node, reason: impl Into<String>) -> ModelError {
        ModelError::Invalid {
            node: node.name.clone(),
            op: node.op.clone(),
            reason: reason.into(),
        }
    }

    /// True for errors a user can fix or must know about (the model, the shapes given, the
    /// inputs), false for failures inside tensortune.
    pub fn is_user_error(&self) -> bool {
        !matches!(self, ModelError::Dag { .. })
    }
}
