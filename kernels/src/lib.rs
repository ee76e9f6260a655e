//! pace-kernels: the compute kernels behind pace's model.
