/* The update modes by name: the one switch over update_mode. */
#include "server/mode/mode.h"

#include <stddef.h>

const pserver_mode_ops *pserver_mode_of(update_mode update) {
  switch (update) {
  case UPDATE_SYNC: return &pserver_mode_sync;
  case UPDATE_ASYNC: return &pserver_mode_async;
  case UPDATE_SSP: return &pserver_mode_ssp;
  case UPDATE_GEO: return &pserver_mode_geo;
  }
  return NULL;
}
