/* The disk tier's readers: a request's rows on disk read by several
 * threads at once, each a MultiGet of a range of the sorted keys. RocksDB
 * reads a MultiGet's blocks one after the other; where they are not in the
 * page cache (a pserver in a small memory cgroup) each is a disk read, and
 * a virtual disk serves several at once about as fast as one. */
#ifndef PSTRAIN_SERVER_STORE_TIER_READERS_H
#define PSTRAIN_SERVER_STORE_TIER_READERS_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "server/store/row_disk.h"

/* Keys per thread at least: fewer are read by the caller alone. */
#define TIER_READ_CHUNK_MIN 64

typedef struct tier_readers tier_readers;

ps_err tier_readers_start(tier_readers **out, row_disk *disk, int threads, ps_error *err);
void tier_readers_stop(tier_readers *r);
/* row_disk_read of table t's n keys (sorted ones read fewer blocks), split
 * over the threads and the caller; one read at a time, callers wait. */
ps_err tier_readers_read(tier_readers *r, int t, const uint64_t *keys, size_t n, void *rows,
                         size_t row_bytes, uint8_t *found, ps_error *err);

#endif
