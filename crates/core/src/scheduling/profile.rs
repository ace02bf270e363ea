//! Scheduling profiles as plain data, and what one run of a profile picked.

/// A scorer in a profile: its index in the scheduler's plugin list and its weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WeightedScorer {
    pub plugin: usize,
    pub weight: f64,
}

/// A scheduling profile, its plugins given as indices into the scheduler's plugin list.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    pub filters: Vec<usize>,
    pub scorers: Vec<WeightedScorer>,
    pub picker: usize,
}

/// The endpoints one profile picked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileResult {
    pub profile: usize,
    /// Primary first, then fallbacks.
    pub targets: Vec<usize>,
}
