# The README's two commands: `make demo` and `make test`. Each installs missing Debian packages,
# configures (Release, ccache) and builds what it needs with all cores.
#   make test SANITIZE=1   builds the tests with ASan+UBSan in build-asan/ and runs them.
#   make bench             builds and runs every benchmark (each prints JSON).
#   make install PREFIX=P  installs headers, libraries, the CLI, the CMake package and troupe.pc.
#   make package           builds the Debian packages troupe and libtroupe-dev in build/packages/.

JOBS  ?= $(shell nproc)
ifeq ($(SANITIZE),1)
BUILD ?= build-asan
CMAKE_FLAGS += -DTROUPE_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
else
BUILD ?= build
CMAKE_FLAGS += -DCMAKE_BUILD_TYPE=Release
endif

PREFIX ?= /usr/local

.PHONY: deps configure build demo test bench install package clean

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >$(BUILD).configure.log 2>&1 || { cat $(BUILD).configure.log; exit 1; }

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

demo: configure
	@cmake --build $(BUILD) -j$(JOBS) --target demo
	@scripts/demo.sh $(BUILD)

# ctest lists the skipped tests after its summary line; the summary is repeated last, so that the
# output ends with it (CI reads the last line).
test: build
	@cd $(BUILD) && { LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp ctest --output-on-failure --timeout 600 \
	  -j$(JOBS) 2>&1; echo "ctest-exit=$$?"; } | tee ctest.log | grep -v '^ctest-exit='; \
	  rc=$$(sed -n 's/^ctest-exit=//p' ctest.log); grep -E '^[0-9]+% tests passed' ctest.log | tail -1; exit $${rc:-1}

bench: build
	@scripts/bench.sh $(BUILD)

install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

package: build
	@cd $(BUILD) && cpack --config CPackConfig.cmake

clean:
	rm -rf build build-asan build.configure.log build-asan.configure.log
