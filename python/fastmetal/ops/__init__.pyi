# fastmetal.ops: the functions' home (public names are re-exported by fastmetal; see
# ../__init__.pyi). Only the generated elementwise stubs live below it.
