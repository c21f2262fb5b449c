pub mod r#gen;
pub mod oracle;
