/* IEEE half and bfloat16 conversions (round to nearest even), for F16/BF16 tensors in files. */
#ifndef TLM_HALF_H
#define TLM_HALF_H

#include <stdint.h>

float core_f16_to_f32(uint16_t h);
uint16_t core_f32_to_f16(float f);
float core_bf16_to_f32(uint16_t h);
uint16_t core_f32_to_bf16(float f);

#endif
