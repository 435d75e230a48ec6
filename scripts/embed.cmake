# cmake -DIN=file -DOUT=file.c -DNAME=symbol -P embed.cmake: writes the bytes of IN as
# `const unsigned char NAME[]` and `const size_t NAME_len` (a NUL follows the bytes).
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n" body "${body}")
file(WRITE "${OUT}.tmp" "/* Generated from ${IN} by scripts/embed.cmake. */\n#include <stddef.h>\n"
     "const unsigned char ${NAME}[] = {\n${body}0x00};\nconst size_t ${NAME}_len = ${len};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
