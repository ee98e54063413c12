//! The unit the stages after classification work on: a class of nodes with its compile key and
//! what runs its compile Job. Only the type: [`super::class_keys`] makes them; schedule, rollout
//! and conditions read them.

use super::Runner;
use crate::plan::classes::Class;

/// A class with its compile key and what runs its compile Job.
pub struct Keyed {
    /// The class.
    pub class: Class,
    /// Its compile key.
    pub key: String,
    /// The image (the one whose backend versions the key names), GPU claim and RuntimeClass.
    pub runner: Runner,
}
