//! Agent settings.
