// A counting allocator for the allocation probe (Benchmarks/alloc-probe), as swift-nio's allocation-counter
// tests do (IntegrationTests/allocation-counter-tests-framework, hooked-functions-unix.c): this target defines
// malloc, calloc, realloc, free, posix_memalign, aligned_alloc, memalign and valloc, and an executable that links
// it interposes them on every shared library of its process (the Swift runtime, Foundation, libuv, nghttp2,
// OpenSSL), because ELF resolves those symbols to the executable's definitions first. Each definition counts
// the call and forwards to glibc's own allocator (__libc_malloc and friends), so nothing else changes.
//
// Link it into a dedicated probe executable only: never into the library, a product or the test runner.
#ifndef C_ALLOCATION_COUNTER_H
#define C_ALLOCATION_COUNTER_H

#include <stdbool.h>
#include <stdint.h>

// Calls counted since the process started, summed over all threads.
typedef struct {
    // malloc, calloc, posix_memalign, aligned_alloc, memalign, valloc, and realloc(NULL, n).
    int64_t allocations;
    // realloc of a live block (realloc(NULL, n) counts as an allocation, realloc(p, 0) as a free).
    int64_t reallocations;
    // free of a non-NULL pointer, and realloc(p, 0).
    int64_t frees;
    // Bytes asked for by those allocations and reallocations (a reallocation counts its new size).
    int64_t bytes;
} CAllocationCounter_Counts;

// True when this build interposes the allocator (glibc); false elsewhere, where the counts stay 0.
bool CAllocationCounter_isActive(void);

// The counts so far. Other threads may be allocating meanwhile: read at points where they are quiet.
CAllocationCounter_Counts CAllocationCounter_read(void);

#endif
