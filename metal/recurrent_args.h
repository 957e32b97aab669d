// Argument block of the recurrent gate kernels (metal/recurrent.metal), shared with the host
// (csrc/ops/recurrent.cpp). Fixed-width fields only.
#pragma once

// One time step of `batch` rows of `hidden` units; relu: the Elman RNN's nonlinearity is
// relu (else tanh).
struct RecurrentArgs {
  int32_t batch;
  int32_t hidden;
  int32_t relu;
  int32_t pad_;
};
