# CEDAR_SANITIZE="address;undefined" adds the matching -fsanitize flags to everything.
if(CEDAR_SANITIZE)
  string(REPLACE ";" "," _san "${CEDAR_SANITIZE}")
  add_compile_options(-fsanitize=${_san} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${_san})
endif()
