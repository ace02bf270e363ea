//! Pickers: choose the endpoint (and fallbacks) from the weighted totals.

pub mod max_score_picker;
pub mod random_picker;
pub mod weighted_random_picker;

use super::spec::PickerParameters;
