/* Generated from records.py by clients/python/tools/gen_records_header.py (make generate).
 * Do not edit: change records.py and regenerate; tests/test_resource_schema.py fails while
 * this file is stale, and _native.c compares it with records.py at import. */
#ifndef STRAP_RESOURCE_RECORDS_H
#define STRAP_RESOURCE_RECORDS_H

/* Generated, one row of the schema a line: not for clang-format. */
/* clang-format off */

/* Record kinds: item 0 of a record. */
#define REC_BEGIN 1
#define REC_LINEAR 2
#define REC_MODULE 3
#define REC_ALLOC_OUT 4
#define REC_ALLOC 5
#define REC_ATTENTION_KV 6
#define REC_HANDOFF 7
#define REC_ATTENTION 8
#define REC_KV 9
#define REC_FORWARD 10
#define REC_PARAMETERS 11
#define REC_ELEMENTWISE 12
#define REC_PREBUILT 13

/* Record fields: their index in the record tuple, and its length. */
#define BEGIN_STEP 1
#define BEGIN_FORWARD 2
#define BEGIN_CLOCK_OFFSET 3
#define BEGIN_LEN 4
#define LINEAR_SITE 1
#define LINEAR_END 2
#define LINEAR_TIMING 3
#define LINEAR_IN_SHAPE 4
#define LINEAR_IN_DTYPE 5
#define LINEAR_OUT_SHAPE 6
#define LINEAR_OUT_DTYPE 7
#define LINEAR_LEN 8
#define MODULE_SITE 1
#define MODULE_END 2
#define MODULE_TIMING 3
#define MODULE_IN_SHAPE 4
#define MODULE_IN_DTYPE 5
#define MODULE_OUT_SHAPE 6
#define MODULE_OUT_DTYPE 7
#define MODULE_LEN 8
#define ALLOC_OUT_SITE 1
#define ALLOC_OUT_END 2
#define ALLOC_OUT_NBYTES 3
#define ALLOC_OUT_IN_SHAPE 4
#define ALLOC_OUT_OUT_SHAPE 5
#define ALLOC_OUT_OUT_DTYPE 6
#define ALLOC_OUT_ADDRESS 7
#define ALLOC_OUT_MEMORY 8
#define ALLOC_OUT_LEN 9
#define ALLOC_SITE 1
#define ALLOC_END 2
#define ALLOC_KIND 3
#define ALLOC_NBYTES 4
#define ALLOC_SHAPE 5
#define ALLOC_DTYPE 6
#define ALLOC_IS_CUDA 7
#define ALLOC_ADDRESS 8
#define ALLOC_MEMORY 9
#define ALLOC_LEN 10
#define ATTENTION_KV_SITE 1
#define ATTENTION_KV_END 2
#define ATTENTION_KV_TIMING 3
#define ATTENTION_KV_IN_SHAPE 4
#define ATTENTION_KV_IN_DTYPE 5
#define ATTENTION_KV_OUT_SHAPE 6
#define ATTENTION_KV_OUT_DTYPE 7
#define ATTENTION_KV_KEY_SHAPE_BEFORE 8
#define ATTENTION_KV_KEY_SHAPE 9
#define ATTENTION_KV_KEY_DTYPE 10
#define ATTENTION_KV_VALUE_SHAPE 11
#define ATTENTION_KV_VALUE_DTYPE 12
#define ATTENTION_KV_ALLOCATION 13
#define ATTENTION_KV_LEN 14
#define HANDOFF_SITE 1
#define HANDOFF_START 2
#define HANDOFF_TIMING 3
#define HANDOFF_SHAPE 4
#define HANDOFF_DTYPE 5
#define HANDOFF_IS_CUDA 6
#define HANDOFF_MEMORY_FRACTION 7
#define HANDOFF_FRACTION_SOURCE 8
#define HANDOFF_LEN 9
#define ATTENTION_SITE 1
#define ATTENTION_END 2
#define ATTENTION_TIMING 3
#define ATTENTION_IN_SHAPE 4
#define ATTENTION_IN_DTYPE 5
#define ATTENTION_IN_CUDA 6
#define ATTENTION_OUT_SHAPE 7
#define ATTENTION_OUT_DTYPE 8
#define ATTENTION_OUT_CUDA 9
#define ATTENTION_QUERY_TOKENS 10
#define ATTENTION_KEY_TOKENS 11
#define ATTENTION_KV 12
#define ATTENTION_FLOPS 13
#define ATTENTION_LEN 14
#define KV_SITE 1
#define KV_END 2
#define KV_LAYER_INDEX 3
#define KV_KV 4
#define KV_LENGTH_BEFORE 5
#define KV_LEN 6
#define FORWARD_SITE 1
#define FORWARD_WALL_NS 2
#define FORWARD_TIMING 3
#define FORWARD_INPUT 4
#define FORWARD_OUT_SHAPE 5
#define FORWARD_CAPTURE_BYTES 6
#define FORWARD_MEMORY 7
#define FORWARD_SM_UTILIZATION 8
#define FORWARD_LEN 9
#define PARAMETERS_SITE 1
#define PARAMETERS_WALL_NS 2
#define PARAMETERS_KIND 3
#define PARAMETERS_NBYTES 4
#define PARAMETERS_SHAPE 5
#define PARAMETERS_DTYPE 6
#define PARAMETERS_IS_CUDA 7
#define PARAMETERS_ADDRESS 8
#define PARAMETERS_MEMORY 9
#define PARAMETERS_LEN 10
#define ELEMENTWISE_SITE 1
#define ELEMENTWISE_WALL_NS 2
#define ELEMENTWISE_OP 3
#define ELEMENTWISE_TENSOR 4
#define ELEMENTWISE_DURATION_NS 5
#define ELEMENTWISE_LEN 6
#define PREBUILT_EVENT 1
#define PREBUILT_LEN 2

/* Template keys: the index of each item, and the key's length. */
#define KEY_LINEAR_SITE 0
#define KEY_LINEAR_IN_SHAPE 1
#define KEY_LINEAR_IN_DTYPE 2
#define KEY_LINEAR_OUT_SHAPE 3
#define KEY_LINEAR_OUT_DTYPE 4
#define KEY_LINEAR_TIMED 5
#define KEY_LINEAR_CUDA_TIMED 6
#define KEY_LINEAR_LEN 7
#define KEY_MODULE_SITE 0
#define KEY_MODULE_IN_SHAPE 1
#define KEY_MODULE_IN_DTYPE 2
#define KEY_MODULE_OUT_SHAPE 3
#define KEY_MODULE_OUT_DTYPE 4
#define KEY_MODULE_TIMED 5
#define KEY_MODULE_CUDA_TIMED 6
#define KEY_MODULE_LEN 7
#define KEY_ALLOC_OUT_OUT 0
#define KEY_ALLOC_OUT_SITE 1
#define KEY_ALLOC_OUT_NBYTES 2
#define KEY_ALLOC_OUT_IN_SHAPE 3
#define KEY_ALLOC_OUT_OUT_SHAPE 4
#define KEY_ALLOC_OUT_OUT_DTYPE 5
#define KEY_ALLOC_OUT_MEMORY_FIELDS 6
#define KEY_ALLOC_OUT_LEN 7
#define KEY_ALLOC_SITE 0
#define KEY_ALLOC_KIND 1
#define KEY_ALLOC_NBYTES 2
#define KEY_ALLOC_SHAPE 3
#define KEY_ALLOC_DTYPE 4
#define KEY_ALLOC_IS_CUDA 5
#define KEY_ALLOC_MEMORY_KEYS 6
#define KEY_ALLOC_LEN 7
#define KEY_ATTENTION_KV_SITE 0
#define KEY_ATTENTION_KV_IN_SHAPE 1
#define KEY_ATTENTION_KV_IN_DTYPE 2
#define KEY_ATTENTION_KV_OUT_SHAPE 3
#define KEY_ATTENTION_KV_OUT_DTYPE 4
#define KEY_ATTENTION_KV_KEY_DTYPE 5
#define KEY_ATTENTION_KV_VALUE_DTYPE 6
#define KEY_ATTENTION_KV_VARIANT 7
#define KEY_ATTENTION_KV_LEN 8
#define KEY_HANDOFF_HANDOFF 0
#define KEY_HANDOFF_SITE 1
#define KEY_HANDOFF_SHAPE 2
#define KEY_HANDOFF_DTYPE 3
#define KEY_HANDOFF_FRACTION_SOURCE 4
#define KEY_HANDOFF_VARIANT 5
#define KEY_HANDOFF_CUDA_TIMED 6
#define KEY_HANDOFF_LEN 7
#define KEY_ATTENTION_ATTENTION 0
#define KEY_ATTENTION_SITE 1
#define KEY_ATTENTION_IN_SHAPE 2
#define KEY_ATTENTION_IN_DTYPE 3
#define KEY_ATTENTION_IN_CUDA 4
#define KEY_ATTENTION_OUT_SHAPE 5
#define KEY_ATTENTION_OUT_DTYPE 6
#define KEY_ATTENTION_OUT_CUDA 7
#define KEY_ATTENTION_KEY_DTYPE 8
#define KEY_ATTENTION_VALUE_DTYPE 9
#define KEY_ATTENTION_VARIANT 10
#define KEY_ATTENTION_CUDA_TIMED 11
#define KEY_ATTENTION_LEN 12
#define KEY_KV_KV 0
#define KEY_KV_SITE 1
#define KEY_KV_KEY_DTYPE 2
#define KEY_KV_KEY_CUDA 3
#define KEY_KV_VARIANT 4
#define KEY_KV_LEN 5

/* Template entries: the index of each item, and the entry's length. */
#define ENTRY_LINEAR_FORMATS 0
#define ENTRY_LINEAR_FLOPS 1
#define ENTRY_LINEAR_NBYTES 2
#define ENTRY_LINEAR_PROGRAMS 3
#define ENTRY_LINEAR_LEN 4
#define ENTRY_LINEAR_NAMES "formats, flops, nbytes, programs"
#define ENTRY_MODULE_FORMAT 0
#define ENTRY_MODULE_FLOPS 1
#define ENTRY_MODULE_NBYTES 2
#define ENTRY_MODULE_COUNTS_TIME 3
#define ENTRY_MODULE_PROGRAM 4
#define ENTRY_MODULE_LEN 5
#define ENTRY_MODULE_NAMES "format, flops, nbytes, counts_time, program"
#define ENTRY_ALLOC_FORMAT 0
#define ENTRY_ALLOC_MEMORY_FILL 1
#define ENTRY_ALLOC_PROGRAM 2
#define ENTRY_ALLOC_LEN 3
#define ENTRY_ALLOC_NAMES "format, memory_fill, program"
#define ENTRY_ATTENTION_KV_ATTENTION_FORMAT 0
#define ENTRY_ATTENTION_KV_KV_FORMAT 1
#define ENTRY_ATTENTION_KV_KEY_ITEMSIZE 2
#define ENTRY_ATTENTION_KV_VALUE_ITEMSIZE 3
#define ENTRY_ATTENTION_KV_ATTENTION_PROGRAM 4
#define ENTRY_ATTENTION_KV_KV_PROGRAM 5
#define ENTRY_ATTENTION_KV_LEN 6
#define ENTRY_ATTENTION_KV_NAMES "attention_format, kv_format, key_itemsize, value_itemsize, attention_program, kv_program"
#define ENTRY_HANDOFF_FORMAT 0
#define ENTRY_HANDOFF_NBYTES 1
#define ENTRY_HANDOFF_PROGRAM 2
#define ENTRY_HANDOFF_LEN 3
#define ENTRY_HANDOFF_NAMES "format, nbytes, program"
#define ENTRY_ATTENTION_FORMAT 0
#define ENTRY_ATTENTION_PROGRAM 1
#define ENTRY_ATTENTION_LEN 2
#define ENTRY_ATTENTION_NAMES "format, program"
#define ENTRY_KV_FORMAT 0
#define ENTRY_KV_KEY_ITEMSIZE 1
#define ENTRY_KV_VALUE_ITEMSIZE 2
#define ENTRY_KV_PROGRAM 3
#define ENTRY_KV_LEN 4
#define ENTRY_KV_NAMES "format, key_itemsize, value_itemsize, program"

enum { STATE_SEQ, STATE_CLOCK_OFFSET, STATE_STEP, STATE_FORWARD, STATE_PASS_FLOPS, STATE_LONG_NS, STATE_LONG_SITE, STATE_TOTAL_FLOPS, STATE_TOTAL_COMPUTE_US, STATE_COMPONENT_FLOWS, STATE_MEMORY_FRACTION, STATE_TEMPLATES, STATE_COUNTS, STATE_KV_BYTES, N_STATE };
static const char *const state_names[N_STATE] = {
    "seq", "clock_offset", "step", "forward", "pass_flops", "long_ns", "long_site", "total_flops", "total_compute_us", "component_flows", "memory_fraction", "templates", "counts", "kv_bytes",
};
enum { RECORDER_HOOK_NS, RECORDER_FORWARD_MEMORY, RECORDER_MEMORY_CELL, N_RECORDER };
static const char *const recorder_names[N_RECORDER] = {
    "hook_ns", "forward_memory", "memory_cell",
};
enum { COUNT_COMPUTE_EXECUTION, COUNT_MLP_OPERATION, COUNT_MEMORY_ALLOCATION, COUNT_KV_CACHE_UPDATE, COUNT_COMPONENT_HANDOFF, N_COUNT };
static const char *const count_names[N_COUNT] = {
    "compute_execution", "mlp_operation", "memory_allocation", "kv_cache_update", "component_handoff",
};
enum { SLOT_TS, SLOT_SEQ, SLOT_SEQ2, SLOT_STEP, SLOT_FWD, SLOT_D, SLOT_TF, SLOT_TB, SLOT_ADDR, SLOT_PROCESS_RSS_BYTES, SLOT_DEVICE_MEMORY_ALLOCATED_BYTES, SLOT_DEVICE_MEMORY_RESERVED_BYTES, SLOT_DEVICE_MEMORY_PEAK_BYTES, SLOT_KS, SLOT_VS, SLOT_QT, SLOT_KT, SLOT_FL, SLOT_GF, SLOT_LEN, SLOT_PREV, SLOT_NEW, SLOT_REUSED, SLOT_HIT, SLOT_CB, SLOT_CMB, SLOT_BPT, SLOT_GROW, SLOT_BW, SLOT_MP, SLOT_MF, N_SLOT };
static const char *const slot_names[N_SLOT] = {
    "ts", "seq", "seq2", "step", "fwd", "d", "tf", "tb", "addr", "process_rss_bytes", "device_memory_allocated_bytes", "device_memory_reserved_bytes", "device_memory_peak_bytes", "ks", "vs", "qt", "kt", "fl", "gf", "len", "prev", "new", "reused", "hit", "cb", "cmb", "bpt", "grow", "bw", "mp", "mf",
};
#define N_MEMORY 4 /* SLOT_PROCESS_RSS_BYTES and the ones after it */

/* The whole schema, row by row, as schema_items() gives it: compared at import. */
typedef struct { const char *section, *owner; int index; const char *name; } SchemaItem;
static const SchemaItem schema_items[] = {
    {"record", "BEGIN", 1, "step"},
    {"record", "BEGIN", 2, "forward"},
    {"record", "BEGIN", 3, "clock_offset"},
    {"record", "LINEAR", 1, "site"},
    {"record", "LINEAR", 2, "end"},
    {"record", "LINEAR", 3, "timing"},
    {"record", "LINEAR", 4, "in_shape"},
    {"record", "LINEAR", 5, "in_dtype"},
    {"record", "LINEAR", 6, "out_shape"},
    {"record", "LINEAR", 7, "out_dtype"},
    {"record", "MODULE", 1, "site"},
    {"record", "MODULE", 2, "end"},
    {"record", "MODULE", 3, "timing"},
    {"record", "MODULE", 4, "in_shape"},
    {"record", "MODULE", 5, "in_dtype"},
    {"record", "MODULE", 6, "out_shape"},
    {"record", "MODULE", 7, "out_dtype"},
    {"record", "ALLOC_OUT", 1, "site"},
    {"record", "ALLOC_OUT", 2, "end"},
    {"record", "ALLOC_OUT", 3, "nbytes"},
    {"record", "ALLOC_OUT", 4, "in_shape"},
    {"record", "ALLOC_OUT", 5, "out_shape"},
    {"record", "ALLOC_OUT", 6, "out_dtype"},
    {"record", "ALLOC_OUT", 7, "address"},
    {"record", "ALLOC_OUT", 8, "memory"},
    {"record", "ALLOC", 1, "site"},
    {"record", "ALLOC", 2, "end"},
    {"record", "ALLOC", 3, "kind"},
    {"record", "ALLOC", 4, "nbytes"},
    {"record", "ALLOC", 5, "shape"},
    {"record", "ALLOC", 6, "dtype"},
    {"record", "ALLOC", 7, "is_cuda"},
    {"record", "ALLOC", 8, "address"},
    {"record", "ALLOC", 9, "memory"},
    {"record", "ATTENTION_KV", 1, "site"},
    {"record", "ATTENTION_KV", 2, "end"},
    {"record", "ATTENTION_KV", 3, "timing"},
    {"record", "ATTENTION_KV", 4, "in_shape"},
    {"record", "ATTENTION_KV", 5, "in_dtype"},
    {"record", "ATTENTION_KV", 6, "out_shape"},
    {"record", "ATTENTION_KV", 7, "out_dtype"},
    {"record", "ATTENTION_KV", 8, "key_shape_before"},
    {"record", "ATTENTION_KV", 9, "key_shape"},
    {"record", "ATTENTION_KV", 10, "key_dtype"},
    {"record", "ATTENTION_KV", 11, "value_shape"},
    {"record", "ATTENTION_KV", 12, "value_dtype"},
    {"record", "ATTENTION_KV", 13, "allocation"},
    {"record", "HANDOFF", 1, "site"},
    {"record", "HANDOFF", 2, "start"},
    {"record", "HANDOFF", 3, "timing"},
    {"record", "HANDOFF", 4, "shape"},
    {"record", "HANDOFF", 5, "dtype"},
    {"record", "HANDOFF", 6, "is_cuda"},
    {"record", "HANDOFF", 7, "memory_fraction"},
    {"record", "HANDOFF", 8, "fraction_source"},
    {"record", "ATTENTION", 1, "site"},
    {"record", "ATTENTION", 2, "end"},
    {"record", "ATTENTION", 3, "timing"},
    {"record", "ATTENTION", 4, "in_shape"},
    {"record", "ATTENTION", 5, "in_dtype"},
    {"record", "ATTENTION", 6, "in_cuda"},
    {"record", "ATTENTION", 7, "out_shape"},
    {"record", "ATTENTION", 8, "out_dtype"},
    {"record", "ATTENTION", 9, "out_cuda"},
    {"record", "ATTENTION", 10, "query_tokens"},
    {"record", "ATTENTION", 11, "key_tokens"},
    {"record", "ATTENTION", 12, "kv"},
    {"record", "ATTENTION", 13, "flops"},
    {"record", "KV", 1, "site"},
    {"record", "KV", 2, "end"},
    {"record", "KV", 3, "layer_index"},
    {"record", "KV", 4, "kv"},
    {"record", "KV", 5, "length_before"},
    {"record", "FORWARD", 1, "site"},
    {"record", "FORWARD", 2, "wall_ns"},
    {"record", "FORWARD", 3, "timing"},
    {"record", "FORWARD", 4, "input"},
    {"record", "FORWARD", 5, "out_shape"},
    {"record", "FORWARD", 6, "capture_bytes"},
    {"record", "FORWARD", 7, "memory"},
    {"record", "FORWARD", 8, "sm_utilization"},
    {"record", "PARAMETERS", 1, "site"},
    {"record", "PARAMETERS", 2, "wall_ns"},
    {"record", "PARAMETERS", 3, "kind"},
    {"record", "PARAMETERS", 4, "nbytes"},
    {"record", "PARAMETERS", 5, "shape"},
    {"record", "PARAMETERS", 6, "dtype"},
    {"record", "PARAMETERS", 7, "is_cuda"},
    {"record", "PARAMETERS", 8, "address"},
    {"record", "PARAMETERS", 9, "memory"},
    {"record", "ELEMENTWISE", 1, "site"},
    {"record", "ELEMENTWISE", 2, "wall_ns"},
    {"record", "ELEMENTWISE", 3, "op"},
    {"record", "ELEMENTWISE", 4, "tensor"},
    {"record", "ELEMENTWISE", 5, "duration_ns"},
    {"record", "PREBUILT", 1, "event"},
    {"key", "LINEAR", 0, "site"},
    {"key", "LINEAR", 1, "in_shape"},
    {"key", "LINEAR", 2, "in_dtype"},
    {"key", "LINEAR", 3, "out_shape"},
    {"key", "LINEAR", 4, "out_dtype"},
    {"key", "LINEAR", 5, "timed"},
    {"key", "LINEAR", 6, "cuda_timed"},
    {"key", "MODULE", 0, "site"},
    {"key", "MODULE", 1, "in_shape"},
    {"key", "MODULE", 2, "in_dtype"},
    {"key", "MODULE", 3, "out_shape"},
    {"key", "MODULE", 4, "out_dtype"},
    {"key", "MODULE", 5, "timed"},
    {"key", "MODULE", 6, "cuda_timed"},
    {"key", "ALLOC_OUT", 0, "'out'"},
    {"key", "ALLOC_OUT", 1, "site"},
    {"key", "ALLOC_OUT", 2, "nbytes"},
    {"key", "ALLOC_OUT", 3, "in_shape"},
    {"key", "ALLOC_OUT", 4, "out_shape"},
    {"key", "ALLOC_OUT", 5, "out_dtype"},
    {"key", "ALLOC_OUT", 6, "memory_fields"},
    {"key", "ALLOC", 0, "site"},
    {"key", "ALLOC", 1, "kind"},
    {"key", "ALLOC", 2, "nbytes"},
    {"key", "ALLOC", 3, "shape"},
    {"key", "ALLOC", 4, "dtype"},
    {"key", "ALLOC", 5, "is_cuda"},
    {"key", "ALLOC", 6, "memory_keys"},
    {"key", "ATTENTION_KV", 0, "site"},
    {"key", "ATTENTION_KV", 1, "in_shape"},
    {"key", "ATTENTION_KV", 2, "in_dtype"},
    {"key", "ATTENTION_KV", 3, "out_shape"},
    {"key", "ATTENTION_KV", 4, "out_dtype"},
    {"key", "ATTENTION_KV", 5, "key_dtype"},
    {"key", "ATTENTION_KV", 6, "value_dtype"},
    {"key", "ATTENTION_KV", 7, "variant"},
    {"key", "HANDOFF", 0, "'handoff'"},
    {"key", "HANDOFF", 1, "site"},
    {"key", "HANDOFF", 2, "shape"},
    {"key", "HANDOFF", 3, "dtype"},
    {"key", "HANDOFF", 4, "fraction_source"},
    {"key", "HANDOFF", 5, "variant"},
    {"key", "HANDOFF", 6, "cuda_timed"},
    {"key", "ATTENTION", 0, "'attention'"},
    {"key", "ATTENTION", 1, "site"},
    {"key", "ATTENTION", 2, "in_shape"},
    {"key", "ATTENTION", 3, "in_dtype"},
    {"key", "ATTENTION", 4, "in_cuda"},
    {"key", "ATTENTION", 5, "out_shape"},
    {"key", "ATTENTION", 6, "out_dtype"},
    {"key", "ATTENTION", 7, "out_cuda"},
    {"key", "ATTENTION", 8, "key_dtype"},
    {"key", "ATTENTION", 9, "value_dtype"},
    {"key", "ATTENTION", 10, "variant"},
    {"key", "ATTENTION", 11, "cuda_timed"},
    {"key", "KV", 0, "'kv'"},
    {"key", "KV", 1, "site"},
    {"key", "KV", 2, "key_dtype"},
    {"key", "KV", 3, "key_cuda"},
    {"key", "KV", 4, "variant"},
    {"entry", "LINEAR", 0, "formats"},
    {"entry", "LINEAR", 1, "flops"},
    {"entry", "LINEAR", 2, "nbytes"},
    {"entry", "LINEAR", 3, "programs"},
    {"entry", "MODULE", 0, "format"},
    {"entry", "MODULE", 1, "flops"},
    {"entry", "MODULE", 2, "nbytes"},
    {"entry", "MODULE", 3, "counts_time"},
    {"entry", "MODULE", 4, "program"},
    {"entry", "ALLOC", 0, "format"},
    {"entry", "ALLOC", 1, "memory_fill"},
    {"entry", "ALLOC", 2, "program"},
    {"entry", "ATTENTION_KV", 0, "attention_format"},
    {"entry", "ATTENTION_KV", 1, "kv_format"},
    {"entry", "ATTENTION_KV", 2, "key_itemsize"},
    {"entry", "ATTENTION_KV", 3, "value_itemsize"},
    {"entry", "ATTENTION_KV", 4, "attention_program"},
    {"entry", "ATTENTION_KV", 5, "kv_program"},
    {"entry", "HANDOFF", 0, "format"},
    {"entry", "HANDOFF", 1, "nbytes"},
    {"entry", "HANDOFF", 2, "program"},
    {"entry", "ATTENTION", 0, "format"},
    {"entry", "ATTENTION", 1, "program"},
    {"entry", "KV", 0, "format"},
    {"entry", "KV", 1, "key_itemsize"},
    {"entry", "KV", 2, "value_itemsize"},
    {"entry", "KV", 3, "program"},
    {"state", "", 0, "seq"},
    {"state", "", 1, "clock_offset"},
    {"state", "", 2, "step"},
    {"state", "", 3, "forward"},
    {"state", "", 4, "pass_flops"},
    {"state", "", 5, "long_ns"},
    {"state", "", 6, "long_site"},
    {"state", "", 7, "total_flops"},
    {"state", "", 8, "total_compute_us"},
    {"state", "", 9, "component_flows"},
    {"state", "", 10, "memory_fraction"},
    {"state", "", 11, "templates"},
    {"state", "", 12, "counts"},
    {"state", "", 13, "kv_bytes"},
    {"recorder", "", 0, "hook_ns"},
    {"recorder", "", 1, "forward_memory"},
    {"recorder", "", 2, "memory_cell"},
    {"count", "", 0, "compute_execution"},
    {"count", "", 1, "mlp_operation"},
    {"count", "", 2, "memory_allocation"},
    {"count", "", 3, "kv_cache_update"},
    {"count", "", 4, "component_handoff"},
    {"slot", "", 0, "ts"},
    {"slot", "", 1, "seq"},
    {"slot", "", 2, "seq2"},
    {"slot", "", 3, "step"},
    {"slot", "", 4, "fwd"},
    {"slot", "", 5, "d"},
    {"slot", "", 6, "tf"},
    {"slot", "", 7, "tb"},
    {"slot", "", 8, "addr"},
    {"slot", "", 9, "process_rss_bytes"},
    {"slot", "", 10, "device_memory_allocated_bytes"},
    {"slot", "", 11, "device_memory_reserved_bytes"},
    {"slot", "", 12, "device_memory_peak_bytes"},
    {"slot", "", 13, "ks"},
    {"slot", "", 14, "vs"},
    {"slot", "", 15, "qt"},
    {"slot", "", 16, "kt"},
    {"slot", "", 17, "fl"},
    {"slot", "", 18, "gf"},
    {"slot", "", 19, "len"},
    {"slot", "", 20, "prev"},
    {"slot", "", 21, "new"},
    {"slot", "", 22, "reused"},
    {"slot", "", 23, "hit"},
    {"slot", "", 24, "cb"},
    {"slot", "", 25, "cmb"},
    {"slot", "", 26, "bpt"},
    {"slot", "", 27, "grow"},
    {"slot", "", 28, "bw"},
    {"slot", "", 29, "mp"},
    {"slot", "", 30, "mf"},
    {"memory", "", 0, "process_rss_bytes"},
    {"memory", "", 1, "device_memory_allocated_bytes"},
    {"memory", "", 2, "device_memory_reserved_bytes"},
    {"memory", "", 3, "device_memory_peak_bytes"},
};
#define N_SCHEMA_ITEMS ((int)(sizeof schema_items / sizeof schema_items[0]))

/* clang-format on */
#endif
