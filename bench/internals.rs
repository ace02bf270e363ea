//! Everything the benchmark takes from the crate itself, in one place: the crate's modules are
//! being reorganised, and a rename lands here rather than in every part.

pub use inference_picker::config::load as load_config;
pub use inference_picker::endpoint::Health;
pub use inference_picker::picker::Picker;
pub use inference_picker::request::{parse_body, ApiKind};
pub use inference_picker::scheduling::rng::Rng;
