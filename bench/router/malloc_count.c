/* An LD_PRELOAD allocation counter for bench/router/count_syscalls.sh: counts every malloc,
 * calloc, realloc, free and aligned allocation of the process (C++ operator new ends in malloc
 * in libstdc++), and the bytes asked for, in a shared memory file that the driver reads before
 * and after a fixed number of requests. No locks, no output, no allocation of its own.
 *
 *   cc -O2 -shared -fPIC -o malloc_count.so malloc_count.c
 *   MALLOC_COUNT_FILE=/tmp/x.counts LD_PRELOAD=./malloc_count.so pdrouter ...
 *
 * The file holds struct Counts (little-endian uint64 each, in this order); it is created (and
 * sized) by the first process that maps it and shared by its children (nginx's workers).
 * glibc only: the real allocator is reached through its __libc_* entry points, so there is no
 * dlsym() bootstrap problem. Calls made before the constructor ran are not counted. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

extern void* __libc_malloc(size_t size);
extern void* __libc_calloc(size_t n, size_t size);
extern void* __libc_realloc(void* p, size_t size);
extern void* __libc_memalign(size_t alignment, size_t size);
extern void __libc_free(void* p);

struct Counts {
  uint64_t mallocs;   /* malloc, calloc, memalign, posix_memalign, aligned_alloc, valloc */
  uint64_t reallocs;  /* realloc with a non-null pointer (a null one counts as a malloc) */
  uint64_t frees;     /* free of a non-null pointer */
  uint64_t bytes;     /* bytes asked for by all of the above */
};

static struct Counts* counts;

__attribute__((constructor)) static void malloc_count_init(void) {
  const char* path = getenv("MALLOC_COUNT_FILE");
  if (path == NULL || *path == '\0') return;
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return;
  if (ftruncate(fd, sizeof(struct Counts)) != 0) {
    close(fd);
    return;
  }
  void* p = mmap(NULL, sizeof(struct Counts), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p != MAP_FAILED) counts = (struct Counts*)p;
}

static void note(uint64_t* counter, size_t bytes) {
  struct Counts* c = counts;
  if (c == NULL) return;
  __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&c->bytes, bytes, __ATOMIC_RELAXED);
}

void* malloc(size_t size) {
  if (counts) note(&counts->mallocs, size);
  return __libc_malloc(size);
}

void* calloc(size_t n, size_t size) {
  if (counts) note(&counts->mallocs, n * size);
  return __libc_calloc(n, size);
}

void* realloc(void* p, size_t size) {
  if (counts) note(p ? &counts->reallocs : &counts->mallocs, size);
  return __libc_realloc(p, size);
}

void free(void* p) {
  if (p && counts) __atomic_fetch_add(&counts->frees, 1, __ATOMIC_RELAXED);
  __libc_free(p);
}

void* memalign(size_t alignment, size_t size) {
  if (counts) note(&counts->mallocs, size);
  return __libc_memalign(alignment, size);
}

void* aligned_alloc(size_t alignment, size_t size) {
  if (counts) note(&counts->mallocs, size);
  return __libc_memalign(alignment, size);
}

void* valloc(size_t size) {
  if (counts) note(&counts->mallocs, size);
  return __libc_memalign((size_t)sysconf(_SC_PAGESIZE), size);
}

int posix_memalign(void** out, size_t alignment, size_t size) {
  if (alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) != 0) return EINVAL;
  if (counts) note(&counts->mallocs, size);
  void* p = __libc_memalign(alignment, size);
  if (p == NULL && size != 0) return ENOMEM;
  *out = p;
  return 0;
}
