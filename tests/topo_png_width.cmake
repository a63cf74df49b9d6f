# cmake -DPNG=FILE -DMAX_WIDTH=N -P topo_png_width.cmake: fails unless FILE is a PNG at most N pixels wide (the IHDR
# width, bytes 16-19), so that an exported topology picture stays legible.
file(READ ${PNG} _head LIMIT 24 HEX)
string(SUBSTRING ${_head} 0 16 _magic)
if(NOT _magic STREQUAL "89504e470d0a1a0a")
  message(FATAL_ERROR "${PNG} is not a PNG")
endif()
string(SUBSTRING ${_head} 32 8 _w)
math(EXPR _width "0x${_w}")
message(STATUS "${PNG}: ${_width} px wide")
if(_width GREATER ${MAX_WIDTH})
  message(FATAL_ERROR "${PNG} is ${_width} px wide, more than ${MAX_WIDTH}")
endif()
