# hopwise_library(NAME SOURCES...): one library per layer, exported as hopwise::NAME with its headers installed.
function(hopwise_library name)
  add_library(hopwise_${name} ${ARGN})
  add_library(hopwise::${name} ALIAS hopwise_${name})
  set_target_properties(hopwise_${name} PROPERTIES EXPORT_NAME ${name} OUTPUT_NAME hopwise_${name})
  target_include_directories(hopwise_${name} PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
                                                    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_options(hopwise_${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${HOPWISE_WARNINGS}>)
  install(TARGETS hopwise_${name} EXPORT hopwiseTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endfunction()
