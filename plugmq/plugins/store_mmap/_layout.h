/* Generated from plugmq/plugins/store_mmap/layout.py by `python scripts/kernel_headers.py`: do not edit.
 * A kernel exports LAYOUT_VERSION; the Python side refuses one built for another. */
#ifndef PLUGMQ_STORE_MMAP_LAYOUT_H
#define PLUGMQ_STORE_MMAP_LAYOUT_H

#define FORMAT_VERSION 1
#define MESSAGE_MAGIC 0xdaa320b7u
#define BLANK_MAGIC 0xcbd43194u
#define END_FILE_MIN_BLANK 8
#define BLANK_SIZE 8
#define HEADER_SIZE 100
#define OFF_TOTAL 0
#define OFF_MAGIC 4
#define OFF_RECORD_CRC 8
#define OFF_BODY_CRC 12
#define OFF_QUEUE_ID 16
#define OFF_FLAG 20
#define OFF_QUEUE_OFFSET 24
#define OFF_PHYS 32
#define OFF_SYS_FLAG 40
#define OFF_BORN_TS 44
#define OFF_BORN_HOST 52
#define OFF_STORE_TS 60
#define OFF_STORE_HOST 68
#define OFF_RECONSUME 76
#define OFF_PREPARED 80
#define OFF_TAGS_CODE 88
#define OFF_BODY_LEN 96
#define RECORD_CRC_FROM 12
#define TOPIC_LEN_SIZE 1
#define PROPS_LEN_SIZE 2
#define MAX_TOPIC_BYTES 255
#define MAX_PROPERTIES_BYTES 65535
#define MIN_RECORD 104
#define FLAG_BORN_HOST_IN_PROPS 1
#define CQ_ENTRY_SIZE 20
#define CQ_OFF_PHYS 0
#define CQ_OFF_SIZE 8
#define CQ_OFF_TAGS 12

#define LAYOUT_VERSION 1160093239

#endif
