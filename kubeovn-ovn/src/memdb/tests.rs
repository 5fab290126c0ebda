//! Unit tests of the in-memory server's transaction semantics.
