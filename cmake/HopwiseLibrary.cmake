# hopwise_library(NAME [CUDA] SOURCES...): one library per layer, exported as hopwise::NAME with its headers
# installed. CUDA: a library that needs the CUDA toolkit; it is exported apart (hopwiseCudaTargets, component
# cuda), so that find_package(hopwise) works on a machine without CUDA and Debian packages leave it out.
function(hopwise_library name)
  cmake_parse_arguments(L "CUDA" "" "" ${ARGN})
  add_library(hopwise_${name} ${L_UNPARSED_ARGUMENTS})
  add_library(hopwise::${name} ALIAS hopwise_${name})
  set_target_properties(hopwise_${name} PROPERTIES EXPORT_NAME ${name} OUTPUT_NAME hopwise_${name})
  target_include_directories(hopwise_${name} PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
                                                    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  # The headers are C++20 (std::span, concepts): a consumer of the exported target compiles them as C++20 even
  # where it sets no standard of its own (GCC 12 defaults to gnu++17).
  target_compile_features(hopwise_${name} PUBLIC cxx_std_20)
  if(L_CUDA)
    install(TARGETS hopwise_${name} EXPORT hopwiseCudaTargets
            ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT cuda)
  else()
    install(TARGETS hopwise_${name} EXPORT hopwiseTargets
            ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
    # The SimGrid transport's header stays home: its library (hopwise_comm_simgrid) is not installed.
    install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev
            PATTERN simgrid_transport.h EXCLUDE)
  endif()
endfunction()

# hopwise_tool(TARGET [CUDA]): a command-line tool, installed in bin/ (component tools, or cuda).
function(hopwise_tool target)
  cmake_parse_arguments(T "CUDA" "" "" ${ARGN})
  set(component tools)
  if(T_CUDA)
    set(component cuda)
  endif()
  install(TARGETS ${target} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ${component})
endfunction()
