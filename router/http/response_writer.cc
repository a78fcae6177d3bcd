#include "router/http/response_writer.h"

#include <utility>

#include "router/http/http_connection.h"

namespace pdr::http {

ResponseWriter::ResponseWriter(std::shared_ptr<HttpConnection> conn, uint64_t seq)
    : conn_(std::move(conn)), seq_(seq) {}

ResponseWriter::ResponseWriter(ResponseWriter&& other) noexcept
    : conn_(std::move(other.conn_)), seq_(other.seq_) {}

ResponseWriter& ResponseWriter::operator=(ResponseWriter&& other) noexcept {
  if (this != &other) {
    release();
    conn_ = std::move(other.conn_);
    seq_ = other.seq_;
  }
  return *this;
}

ResponseWriter::~ResponseWriter() { release(); }

void ResponseWriter::release() {
  if (!conn_) return;
  std::shared_ptr<HttpConnection> conn = std::move(conn_);
  conn_.reset();
  conn->writer_dropped(seq_);
}

bool ResponseWriter::send(Response response) {
  return conn_ && conn_->writer_send(seq_, std::move(response));
}

bool ResponseWriter::start_stream(int status, std::vector<Header> headers) {
  return conn_ && conn_->writer_start_stream(seq_, status, std::move(headers));
}

bool ResponseWriter::write(std::string_view chunk) { return conn_ && conn_->writer_write(seq_, chunk); }

void ResponseWriter::end_stream() {
  if (conn_) conn_->writer_end_stream(seq_);
}

size_t ResponseWriter::buffered_bytes() const { return conn_ ? conn_->writer_buffered_bytes(seq_) : 0; }

void ResponseWriter::on_drain(std::function<void()> fn) {
  if (conn_) conn_->writer_on_drain(seq_, std::move(fn));
}

void ResponseWriter::on_client_close(std::function<void()> fn) {
  if (conn_) conn_->writer_on_client_close(seq_, std::move(fn));
}

void ResponseWriter::abort() {
  if (conn_) conn_->writer_abort(seq_);
}

bool ResponseWriter::client_gone() const { return !conn_ || conn_->writer_client_gone(seq_); }

}  // namespace pdr::http
