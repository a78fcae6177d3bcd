// An empty file: the targets that build the precompiled headers (cmake/pch/CMakeLists.txt) need one source.
