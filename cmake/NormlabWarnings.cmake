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
  # Line tables only (after the build type's -g, so it wins): the sanitizers' reports keep their functions,
  # files and lines; the units compile in 7-15 % less time. (The debug preset keeps full debug information.)
  add_compile_options(-g1)
  add_link_options(-fsanitize=address,undefined)
  # Executables not position-independent: GCC's sanitizers give every UBSan check a descriptor that ASan
  # instruments as a global (about a million in the test programs, ~100 MB of .data), and a PIE's dynamic
  # linker relocates each of their pointers at every start, 0.3 s of the 0.6 s a test process took to
  # start (docs/PERFORMANCE.md, "forty-second session"). Without PIE the linker resolves them once.
  add_link_options($<$<STREQUAL:$<TARGET_PROPERTY:TYPE>,EXECUTABLE>:-no-pie>)
endif()
