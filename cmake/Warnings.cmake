# Warning flags shared by every cedar target (applied through cedar_set_warnings).
function(cedar_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(CEDAR_FATAL_WARNINGS)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
