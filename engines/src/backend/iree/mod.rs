//! IREE, kiln's next engine (issue 50, in progress): a model lowered through MLIR to machine code
//! for one node class, by IREE's compiler (PyPI `iree-base-compiler`, `scripts/ensure/iree.sh`)
//! with the class's CPU level as its target CPU, and run by IREE's runtime. What exists so far:
//! the check that must come before any load, because IREE's runtime has none ([`target`] reads
//! the targets a compiled module records and says which CPU features this machine lacks), and
//! [`terms`], which reads the operators the compiler refused out of its errors.

pub mod target;
pub mod terms;
