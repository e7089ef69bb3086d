/* How many processes a job may have, written once: the command lines, the
 * endpoint lists and the wire (a received job description) check the same
 * bounds, so nothing one side accepts is refused by the other. */
#ifndef PSTRAIN_COMMON_JOB_LIMITS_H
#define PSTRAIN_COMMON_JOB_LIMITS_H

/* Every pserver is an entry of --pservers, which holds this many. */
#define PSTRAIN_MAX_PSERVERS 256
/* Trainer ids are 0..PSTRAIN_MAX_TRAINERS - 1. */
#define PSTRAIN_MAX_TRAINERS 4096
/* --staleness: steps an SSP trainer may lead the slowest. */
#define PSTRAIN_MAX_STALENESS 1000000
/* --geo-steps: local steps between a GEO trainer's exchanges. */
#define PSTRAIN_MAX_GEO_STEPS 1000000
/* --shard-steps: batches in a handed-out shard of the data. */
#define PSTRAIN_MAX_SHARD_STEPS 1000000
/* The input normalization's text ("m,m,m/s,s,s", %.9g each) and channels. */
#define PSTRAIN_INPUT_NORM_MAX 128
#define PSTRAIN_INPUT_NORM_CHANNELS 4

#endif
