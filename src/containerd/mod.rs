//! The containerd config engine.
