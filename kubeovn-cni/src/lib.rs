//! CNI specification types (in progress).
