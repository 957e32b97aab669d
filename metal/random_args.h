// Argument block of the fastmetal.random kernels (metal/random.metal), shared with the host
// (csrc/ops/random.cpp). Fixed-width fields only, 8-byte fields first.
#pragma once

// Element i of a draw is made from word i % 4 of Philox-4x32-10(counter = (b, b >> 32, 0, 0),
// key = (key0, key1)) with b = counter + i / 4 (64-bit): the generator's state is its seed
// (the key) and the number of blocks it has used (the counter), so a draw is the same on
// every device and for any number of threads. Thread g of a launch makes block first + g.
struct RandomArgs {
  uint64_t n;           // elements of the draw
  uint64_t counter;     // the generator's first block for this draw
  uint32_t first;       // the draw's block made by thread 0 (the tail launch: n / 4)
  uint32_t key0, key1;  // seed % 2^32, seed / 2^32
  float a, b;           // uniform: low, high - low; normal: mean, std
  uint32_t threshold;   // bernoulli: 1 where the word's 24 high bits are below it
  uint32_t bits;        // uniform: the mantissa bits used (24 for float32, 11 for float16)
  uint32_t pad_;
};
