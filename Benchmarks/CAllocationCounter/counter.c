// See include/CAllocationCounter.h for why this exists. Counters are relaxed atomics: the probe reads them at
// points where the threads it measures are idle, so no ordering beyond each counter's own is needed.
#include "CAllocationCounter.h"

#if defined(__GLIBC__)
#include <errno.h>
#include <stddef.h>

// glibc's allocator under its internal names: exported by libc.so.6 (GLIBC_2.2.5), so forwarding to them needs
// no dlsym, which itself allocates and would recurse into these definitions.
extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *pointer, size_t size);
extern void __libc_free(void *pointer);
extern void *__libc_memalign(size_t alignment, size_t size);
extern void *__libc_valloc(size_t size);

static int64_t allocations;
static int64_t reallocations;
static int64_t frees;
static int64_t bytes;

static inline void count(int64_t *counter) { __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED); }
static inline void add_bytes(size_t size) { __atomic_fetch_add(&bytes, (int64_t)size, __ATOMIC_RELAXED); }

bool CAllocationCounter_isActive(void) { return true; }

CAllocationCounter_Counts CAllocationCounter_read(void) {
    CAllocationCounter_Counts counts = {
        .allocations = __atomic_load_n(&allocations, __ATOMIC_RELAXED),
        .reallocations = __atomic_load_n(&reallocations, __ATOMIC_RELAXED),
        .frees = __atomic_load_n(&frees, __ATOMIC_RELAXED),
        .bytes = __atomic_load_n(&bytes, __ATOMIC_RELAXED),
    };
    return counts;
}

void *malloc(size_t size) {
    count(&allocations);
    add_bytes(size);
    return __libc_malloc(size);
}

void *calloc(size_t count_, size_t size) {
    count(&allocations);
    add_bytes(count_ * size);
    return __libc_calloc(count_, size);
}

void *realloc(void *pointer, size_t size) {
    if (pointer == NULL) {
        count(&allocations);
        add_bytes(size);
    } else if (size == 0) {
        count(&frees);
    } else {
        count(&reallocations);
        add_bytes(size);
    }
    return __libc_realloc(pointer, size);
}

void free(void *pointer) {
    if (pointer != NULL) count(&frees);
    __libc_free(pointer);
}

int posix_memalign(void **result, size_t alignment, size_t size) {
    // posix_memalign's rule: a power of two and a multiple of sizeof(void *); glibc's memalign would round up.
    if (alignment % sizeof(void *) != 0 || (alignment & (alignment - 1)) != 0) return EINVAL;
    count(&allocations);
    add_bytes(size);
    void *pointer = __libc_memalign(alignment, size);
    if (pointer == NULL) return ENOMEM;
    *result = pointer;
    return 0;
}

void *aligned_alloc(size_t alignment, size_t size) {
    count(&allocations);
    add_bytes(size);
    return __libc_memalign(alignment, size);
}

void *memalign(size_t alignment, size_t size) {
    count(&allocations);
    add_bytes(size);
    return __libc_memalign(alignment, size);
}

void *valloc(size_t size) {
    count(&allocations);
    add_bytes(size);
    return __libc_valloc(size);
}

#else

bool CAllocationCounter_isActive(void) { return false; }

CAllocationCounter_Counts CAllocationCounter_read(void) {
    CAllocationCounter_Counts counts = {0, 0, 0, 0};
    return counts;
}

#endif
