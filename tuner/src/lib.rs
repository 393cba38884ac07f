//! tensortune-tuner: search space and search (to be built: issue 6).
