//! Compile admission, the decision: how many of one target's compile candidates get one of
//! `--max-concurrent-compiles` slots, given the compiles already holding one. Pure; the slot
//! ledger the count comes from, and the lock around it, are [`crate::recall::admission`]'s.

/// How many of a target's compile candidates get a slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Admission {
    /// The first this many candidates (in the plan's order) get a slot; the rest are queued.
    /// The default admits none (for a plan without candidates).
    pub admitted: usize,
    /// The limit applied, for the queued rows' message.
    pub limit: usize,
}

/// The decision: of `candidates` asking, with `running` compiles already holding slots (other
/// targets' and this target's own), how many fit under `limit` (at least 1).
pub fn admit(limit: usize, running: usize, candidates: usize) -> Admission {
    let limit = limit.max(1);
    Admission {
        admitted: limit.saturating_sub(running).min(candidates),
        limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_what_fits_under_the_limit_in_order() {
        assert_eq!(admit(4, 2, 3).admitted, 2);
        assert_eq!(
            admit(4, 5, 3).admitted,
            0,
            "over the limit: none, no underflow"
        );
        assert_eq!(admit(4, 0, 1).admitted, 1);
        assert_eq!(
            admit(0, 0, 3),
            Admission {
                admitted: 1,
                limit: 1
            },
            "at least one"
        );
    }
}
