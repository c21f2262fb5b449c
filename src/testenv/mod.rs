//! Machinery for tests, the demo and benchmarks only: a real local control
//! plane built from Go modules ([`localcluster`]), real PostgreSQL and MariaDB
//! servers ([`db`]), Argo's own workflow-controller ([`argo`]), generators
//! of failed Argo workloads ([`workload`]), the retry benchmark's
//! measuring ([`bench`]) and crash trials ([`trials`]). Behind the
//! `testenv` feature, so a reader (or a build) of the controller never
//! wades through it.

pub mod argo;
pub mod bench;
pub mod clients;
pub mod db;
pub mod localcluster;
pub mod trials;
pub mod workload;
