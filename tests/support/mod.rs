//! Shared by several test binaries; each uses only part of it.
#![allow(dead_code)]

pub mod r#gen;
pub mod oracle;
