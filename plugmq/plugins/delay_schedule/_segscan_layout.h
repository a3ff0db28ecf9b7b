/* Generated from plugmq/plugins/delay_schedule/layout.py by `python scripts/kernel_headers.py`: do not edit.
 * A kernel exports LAYOUT_VERSION; the Python side refuses one built for another. */
#ifndef PLUGMQ_DELAY_SCHEDULE_LAYOUT_H
#define PLUGMQ_DELAY_SCHEDULE_LAYOUT_H

#define FORMAT_VERSION 1
#define SCH_MAGIC 1364411185
#define SCH_HEAD_SIZE 52
#define SCH_OFF_MAGIC 0
#define SCH_OFF_SIZE 4
#define SCH_OFF_CRC 8
#define SCH_OFF_STORE_TS 12
#define SCH_OFF_SCHEDULE_TIME 20
#define SCH_OFF_SEQ 28
#define SCH_OFF_SOURCE 36
#define SCH_OFF_INDEX 44
#define SCH_OFF_DELAY_LEVEL 48
#define SCH_CRC_FROM 12
#define SCH_TAIL_SIZE 8
#define SCH_TAIL_OFF_SIZE 0
#define SCH_TAIL_OFF_MAGIC 4
#define SCH_MAX_RECORD 67108864
#define DISPATCH_SIZE 16
#define DISPATCH_OFF_KIND 0
#define DISPATCH_OFF_CRC 4
#define DISPATCH_OFF_SEQ 8
#define DISPATCH_CRC_PART_SIZE 9

#define LAYOUT_VERSION 2141127525

#endif
