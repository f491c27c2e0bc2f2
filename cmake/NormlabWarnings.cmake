# Warnings, strict floating point and sanitizers for every normlab target.
# No -ffast-math anywhere: results must follow IEEE semantics and be reproducible. -ffp-contract=off
# keeps the compiler from fusing a*b+c differently per instruction set, so every target computes the
# same bits.
function(normlab_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wno-unknown-pragmas
                                           -ffp-contract=off)
  if(NORMLAB_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

if(NORMLAB_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
