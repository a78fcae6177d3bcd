#include "discovery/sources/kubernetes/pod_node.h"

#include <gtest/gtest.h>

namespace pdr::discovery::sources::kubernetes {
namespace {

proto::PodInfo serving_pod(std::string role) {
  proto::PodInfo pod;
  pod.name = "p";
  pod.uid = "uid-p";
  pod.phase = "Running";
  pod.ready = true;
  pod.pod_ip = "127.0.0.2";
  if (!role.empty()) pod.labels.push_back({"pdrouter.io/role", role});
  return pod;
}

struct PodNode : testing::Test {
  config::Topology::Kubernetes k8s;
  config::Topology::Connectors connectors;
  PodNode() { connectors.default_connector = proto::Connector::kNixl; }
};

TEST_F(PodNode, ServingNeedsRunningReadyAndAnIp) {
  proto::PodInfo pod = serving_pod("decode");
  EXPECT_TRUE(pod_is_serving(pod));
  pod.ready = false;
  EXPECT_FALSE(pod_is_serving(pod));
  pod = serving_pod("decode");
  pod.phase = "Pending";
  EXPECT_FALSE(pod_is_serving(pod));
  pod = serving_pod("decode");
  pod.pod_ip.clear();
  EXPECT_FALSE(pod_is_serving(pod));
}

TEST_F(PodNode, DefaultsAndAnnotationsMakeTheRegistration) {
  proto::Registration reg;
  proto::PodInfo pod = serving_pod("decode");
  ASSERT_TRUE(pod_registration(pod, k8s, connectors, &reg));
  EXPECT_EQ(reg.http_address.to_string(), "127.0.0.2:8000");
  EXPECT_EQ(reg.role, proto::Role::kDecode);
  EXPECT_EQ(reg.connector, proto::Connector::kNixl);
  EXPECT_EQ(reg.instance_id, "uid-p");
  EXPECT_FALSE(reg.draining);

  pod = serving_pod("prefill");
  pod.deleting = true;
  pod.annotations = {{"pdrouter.io/port", "9001"},
                     {"pdrouter.io/connector", "mooncake"},
                     {"pdrouter.io/model", "m"},
                     {"pdrouter.io/kv-events-port", "5557"},
                     {"pdrouter.io/dp-size", "2"}};
  ASSERT_TRUE(pod_registration(pod, k8s, connectors, &reg));
  EXPECT_EQ(reg.http_address.to_string(), "127.0.0.2:9001");
  EXPECT_EQ(reg.connector, proto::Connector::kMooncake);
  EXPECT_EQ(reg.bootstrap_port, connectors.mooncake_bootstrap_port);  // a Mooncake prefill's default
  EXPECT_EQ(reg.model, "m");
  ASSERT_TRUE(reg.kv_events_endpoint.has_value());
  EXPECT_EQ(reg.kv_events_endpoint->to_string(), "127.0.0.2:5557");
  EXPECT_EQ(reg.dp_size, 2u);
  EXPECT_TRUE(reg.draining);

  pod = serving_pod("prefill");
  pod.annotations = {{"pdrouter.io/connector", "moriio"},
                     {"pdrouter.io/zmq-address", "host:{pod_ip},handshake:6301,notify:6401"},
                     {"pdrouter.io/transfer-mode", "READ"}};
  ASSERT_TRUE(pod_registration(pod, k8s, connectors, &reg));
  EXPECT_EQ(reg.zmq_address, "host:127.0.0.2,handshake:6301,notify:6401");
  EXPECT_EQ(reg.transfer_mode, proto::TransferMode::kRead);
  EXPECT_TRUE(reg.moriio_zmq.has_value());
}

TEST_F(PodNode, BadLabelsAndAnnotationsAreNamed) {
  proto::Registration reg;
  reg.model = "untouched";
  EXPECT_NE(pod_registration(serving_pod(""), k8s, connectors, &reg).message().find("pdrouter.io/role"),
            std::string::npos);
  EXPECT_FALSE(pod_registration(serving_pod("both"), k8s, connectors, &reg));
  for (auto [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"pdrouter.io/port", "0"}, {"pdrouter.io/port", "70000"}, {"pdrouter.io/port", "80x"},
           {"pdrouter.io/connector", "pigeon"}, {"pdrouter.io/dp-size", "0"},
           {"pdrouter.io/bootstrap-port", ""}}) {
    proto::PodInfo pod = serving_pod("decode");
    pod.annotations = {{key, value}};
    const Status st = pod_registration(pod, k8s, connectors, &reg);
    EXPECT_FALSE(st) << key << "=" << value;
    EXPECT_NE(st.message().find(key), std::string::npos) << st.message();
  }
  // MoRIIO without its zmq address: the connector rules of a topology instance apply.
  proto::PodInfo pod = serving_pod("decode");
  pod.annotations = {{"pdrouter.io/connector", "moriio"}};
  EXPECT_FALSE(pod_registration(pod, k8s, connectors, &reg));
  pod = serving_pod("decode");
  pod.pod_ip = "not-an-ip!";
  EXPECT_FALSE(pod_registration(pod, k8s, connectors, &reg));
  EXPECT_EQ(reg.model, "untouched");
}

TEST_F(PodNode, SelectorsGiveTheRoleInsteadOfTheRoleLabel) {
  ASSERT_TRUE(proto::parse_label_selector("app=vllm,llm-d.ai/role in (prefill)", &k8s.prefill_selector));
  ASSERT_TRUE(proto::parse_label_selector("app=vllm,llm-d.ai/role=decode", &k8s.decode_selector));
  proto::Registration reg;
  proto::PodInfo pod = serving_pod("");
  pod.labels = {{"app", "vllm"}, {"llm-d.ai/role", "prefill"}};
  ASSERT_TRUE(pod_registration(pod, k8s, connectors, &reg));
  EXPECT_EQ(reg.role, proto::Role::kPrefill);
  pod.labels = {{"app", "vllm"}, {"llm-d.ai/role", "decode"}, {"pdrouter.io/role", "prefill"}};
  ASSERT_TRUE(pod_registration(pod, k8s, connectors, &reg));
  EXPECT_EQ(reg.role, proto::Role::kDecode);  // the role label means nothing with selectors

  pod.labels = {{"app", "vllm"}};
  Status st = pod_registration(pod, k8s, connectors, &reg);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);  // neither: not a node, not an error

  ASSERT_TRUE(proto::parse_label_selector("app=vllm", &k8s.prefill_selector));
  pod.labels = {{"app", "vllm"}, {"llm-d.ai/role", "decode"}};
  st = pod_registration(pod, k8s, connectors, &reg);
  EXPECT_EQ(st.code(), StatusCode::kRejected);
  EXPECT_EQ(st.message(), "its labels match both prefill_selector and decode_selector");
}

}  // namespace
}  // namespace pdr::discovery::sources::kubernetes
