//! The user contract: what users write to ask for a retry and what rewind
//! writes back. Stable once shipped.

pub mod crd;
pub mod hint;
pub mod names;
pub mod request;
