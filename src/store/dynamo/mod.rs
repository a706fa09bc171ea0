//! The task store's table in DynamoDB: tasks, jobs, runs, counter shards, hosts and spend.

pub mod attributes;
pub mod expressions;
pub mod hosts;
pub mod keys;
pub mod runs;
pub mod shards;
pub mod spend;
pub mod tasks;
