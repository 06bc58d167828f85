// A TCP port on 127.0.0.1 that nothing listens on right now (tests that start servers).
#ifndef SPECD_TESTING_FREE_PORT_H_
#define SPECD_TESTING_FREE_PORT_H_

namespace specd::testing {

int FreeTcpPort();

}  // namespace specd::testing

#endif  // SPECD_TESTING_FREE_PORT_H_
