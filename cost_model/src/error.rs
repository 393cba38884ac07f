//! The one error type of the crate.

use std::path::PathBuf;

/// What can go wrong when training, predicting, saving or loading a cost model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A sample's throughput is NaN, infinite or negative (failed programs have 0.0).
    #[error("sample {index}: throughput {value} is not a finite, non-negative number")]
    InvalidThroughput {
        /// Position of the sample in the slice given.
        index: usize,
        /// The value found.
        value: f64,
    },
    /// Options that cannot work (e.g. a zero learning rate).
    #[error("invalid cost-model options: {0}")]
    InvalidOptions(String),
    /// XGBoost reported an error.
    #[error("XGBoost: {0}")]
    Xgboost(String),
    /// A model file could not be read or written.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's message.
        message: String,
    },
    /// A file that is not a model this version can load.
    #[error("{path} is not a usable tensortune cost model: {message}")]
    BadModelFile {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The records database failed.
    #[error(transparent)]
    Records(#[from] tensortune_records::RecordsError),
    /// A target with no records, or an ambiguous choice of target.
    #[error("{0}")]
    NoData(String),
}
