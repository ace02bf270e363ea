//! Profile handlers: which scheduling profiles run, and whose result routes the request.

pub mod disagg_profile_handler;
pub mod header_profile_handler;
pub mod pd_profile_handler;
pub mod single_profile_handler;

use super::spec::{no_parameters, parameters};
