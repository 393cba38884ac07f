//! tensortune-cost-model: program features and cost models (to be built: issue 5).
