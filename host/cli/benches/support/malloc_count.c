/* Counts the heap allocations of the process it is preloaded into (LD_PRELOAD), from
 * outside the program: malloc, calloc and realloc calls, as uprobes on libc's would.
 * The count lives in the first 8 bytes of the file named by MALLOC_COUNT_FILE (mapped
 * shared), so the bench reads it while the daemon runs. Built by benches/allocs.rs. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

static _Atomic unsigned long early;
static _Atomic unsigned long *counter = &early;

__attribute__((constructor)) static void map_counter(void) {
    const char *path = getenv("MALLOC_COUNT_FILE");
    if (!path) return;
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0) return;
    if (ftruncate(fd, 8) != 0) { close(fd); return; }
    void *at = mmap(NULL, 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (at != MAP_FAILED) counter = at;
}

void *malloc(size_t n) {
    atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t size) {
    atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
    return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n) {
    atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
    return __libc_realloc(p, n);
}
