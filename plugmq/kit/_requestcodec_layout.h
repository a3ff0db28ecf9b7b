/* Generated from plugmq/kit/requestcodec.py by `python scripts/kernel_headers.py`: do not edit.
 * A kernel exports LAYOUT_VERSION; the Python side refuses one built for another. */
#ifndef PLUGMQ_KIT_REQUESTCODEC_LAYOUT_H
#define PLUGMQ_KIT_REQUESTCODEC_LAYOUT_H

#define FORMAT_VERSION 2
#define LAYOUT_ITEMS 21
#define REQUEST_FIELDS 10
#define MAX_EXTRAS 8
#define MAX_DROP 8
#define PUT_PLAN_ITEMS 17

#define LAYOUT_VERSION 1590028269

#endif
