// input_output_aliases, kept by numbax whatever XLA hands the handler.
//
// An op declared with input_output_aliases={i: o} promises func (or the
// kernel) that output o starts out holding input i's values: it is the
// input's own buffer. XLA usually keeps that promise by handing both the
// same buffer. Not always: inside a loop over slices (vmap 'sequential',
// lax.map, scan), XLA's GPU dynamic_slice_fusion reads the call's input from
// the stacked inputs and writes its result into the stacked outputs, two
// different buffers, and the output starts out as whatever was there (zeros,
// on the H200). An in-place kernel (`a[i] += 1`, RNG states advanced in
// place) then starts from the wrong values: a silent wrong result.
//
// So every handler, before anything runs, checks each aliased pair and
// copies the input into the output where they are not one buffer, on the
// op's own stream (ordered before the launch or func's launches).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "call_frame.h"
#include "cuda_driver.h"

namespace numbax {

struct Alias {
  int64_t input;   // index among the inputs
  int64_t output;  // index among the outputs
};
using AliasList = std::vector<Alias>;

// An empty string, or why `aliases` cannot belong to an op of these
// counts: an index out of range, or two inputs for one output.
std::string CheckAliases(const AliasList& aliases, int64_t num_inputs,
                         int64_t num_outputs);

// How many copies the handlers made because XLA handed an aliased output a
// buffer of its own (numbax.bridge_counters()["alias_copies"]).
std::atomic<uint64_t>& AliasCopyCount();

// Where an aliased output is not its input's buffer, copies the input into
// it: on `stream` through the driver (device memory), or with `stream` and
// `driver` null, on the host (the CPU simulator's buffers). `buffers` are
// the inputs then the outputs (then any scratch). Returns an empty string,
// or the error: sizes that differ, buffers that overlap without being the
// same (a copy would read what it wrote), an output over another input (the
// copy would change that input before it is read), or the driver's
// refusal. Every pair is checked before anything is copied.
std::string KeepAliasedInputs(const cuda::Driver* driver, cuda::CUstream stream,
                              const std::vector<BufferView>& buffers,
                              int64_t num_inputs, const AliasList& aliases);

}  // namespace numbax
