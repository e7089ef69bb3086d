#!/usr/bin/env bash
# test_wire_dtype_train on the default recipe's 12 epochs (about a minute).
WIRE_EPOCHS=12 exec bash "$(dirname "$0")/test_wire_dtype_train.sh" "$@"
