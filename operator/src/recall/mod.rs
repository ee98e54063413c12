//! What one replica remembers between passes, so that it neither asks nor writes the same thing
//! twice and does not lose sight of what it just did while its caches lag: the objects it just
//! wrote ([`memo`]), store lookups by compile key ([`lookups`]), the compile slots it took
//! ([`admission`], the ledger [`crate::plan::admit`] counts from) and when each target's status
//! was last written ([`pace`]). Each decides purely what to remember and for how long (the clock
//! is passed in, or read only for a window); none talks to the API.

pub mod admission;
pub mod lookups;
pub mod memo;
pub mod pace;
