/* --tensorboard: TensorBoard event files of scalars, which TensorBoard
 * (tensorboard --logdir DIR) shows as curves. Not a general summary writer:
 * scalars only, no images, histograms or graphs.
 *
 * A file is a sequence of TFRecords, each
 *   uint64 length (little-endian), uint32 masked CRC-32C of those 8 bytes,
 *   length bytes of data, uint32 masked CRC-32C of the data,
 * holding one tensorflow.Event (proto/tb_event.proto) each: first the
 * file_version "brain.Event:2", then one Event per tb_writer_write with the
 * step, the wall time and a Summary of tagged float values. Each call's
 * record is written with one write(2), so a TensorBoard watching the folder
 * sees it at once and a process killed afterwards leaves whole records. */
#ifndef PSTRAIN_COMMON_TB_EVENTS_H
#define PSTRAIN_COMMON_TB_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

/* Bytes a record's framing adds to its data: 8 + 4 before, 4 after. */
#define TB_RECORD_OVERHEAD 16

/* TFRecord's masked CRC-32C of len bytes: ((crc >> 15) | (crc << 17)) +
 * 0xa282ead8, so a CRC of data that holds CRCs does not look like one. */
uint32_t tb_masked_crc32c(const void *data, size_t len);

/* Frames len bytes of data as one record into out, which must hold
 * len + TB_RECORD_OVERHEAD bytes; data may already lie at out + 12 (it is
 * then not copied). */
void tb_record_frame(unsigned char *out, const void *data, size_t len);

/* One tagged value of an event ("train/loss"). */
typedef struct tb_scalar {
  const char *tag;
  double value; /* written as float32, as TensorBoard's simple_value is */
} tb_scalar;

typedef struct tb_writer tb_writer;

/* Makes folder dir if missing (its parent must exist) and dir/run in it,
 * creates dir/run/events.out.tfevents.<unix seconds>.<host name>.<pid>
 * (TensorBoard's naming; ".N" appended should that name exist) and writes
 * the file_version record. dir "": *out is NULL and nothing is made.
 * Errors (PS_ERR_IO, PS_ERR_NO_MEMORY) name "--tensorboard", the path and
 * the system's reason. The caller owns *out (tb_writer_close). */
ps_err tb_writer_open(tb_writer **out, const char *dir, const char *run, ps_error *err);

/* The events file's path ("" for a NULL writer). */
const char *tb_writer_path(const tb_writer *w);

/* Appends one Event at step holding count values (one record, one
 * write(2)). A failed write is PS_ERR_IO naming the file and why; the
 * writer is then closed for writing and every later call returns the same
 * error without writing (a torn record could follow a partial write). A
 * NULL writer: nothing, PS_ERR_OK. Not thread-safe: one thread at a time
 * (the pserver calls it under its lock). */
ps_err tb_writer_write(tb_writer *w, long step, const tb_scalar *values, int count,
                       ps_error *err);

/* Closes the file and frees w; NULL is fine. A failing close is logged. */
void tb_writer_close(tb_writer *w);

#endif
